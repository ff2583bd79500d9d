"""Gluon names that differ between the Triton releases the kernels are built with: 3.6 (the
GPU machine's, where they were measured) and 3.8 (what SGLang 0.5.23's torch 2.14 pins, so the
production image's runtime). Gluon's API is experimental; each alias here is the same builtin
under its other name, so the compiled code is the same."""
from triton.experimental.gluon import language as gl

# a barrier of the CTA's threads (of a warp_specialize partition's warps inside one); 3.8 renamed it
cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
