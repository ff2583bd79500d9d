"""Two fixes to Triton's CPU interpreter (TRITON_INTERPRET=1), applied only by the CPU tests.

Triton 3.6's interpreter (with numpy >= 2) has two gaps that the compiled kernels do not:
  * scalars are 1-element arrays, and ``range(lo, hi)`` calls ``int()`` on them, which numpy 2
    refuses for non-0-d arrays;
  * ``tl.dot`` on bfloat16 operands multiplies their raw uint16 storage (bf16 is stored as uint16
    there) instead of their values.
Both are patched to what the compiled code does: take the one element; upcast bf16 exactly to
float32 before the product (the GPU's MMA also accumulates bf16 x bf16 products in float32).
"""
import numpy as np
import triton.language as tl
import triton.runtime.interpreter as ti

_done = False


def install():
    global _done
    if _done:
        return
    _done = True

    orig_patch = ti._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        orig_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    ti._patch_lang_tensor = patch_lang_tensor

    orig_dot = ti.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def up(x):
            if x.dtype.scalar == tl.bfloat16:
                data = ti._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32)
                return ti.TensorHandle(data, tl.float32)
            return x
        return orig_dot(self, up(a), up(b), d, input_precision, max_num_imprecise_acc)

    ti.InterpreterBuilder.create_dot = create_dot
