"""dflash_kernels: GPU kernels for speculative decoding (DFlash / DDTree) verify steps."""
from .verify_attention import (  # noqa: F401
    VerifyConfig,
    alloc_workspace,
    chain_tree_mask,
    draft_block_mask,
    pack_custom_mask,
    pack_tree_masks,
    reference_verify_attention,
    tree_mask_from_parents,
    verify_attention,
    workspace_shape,
)

__version__ = "0.1.0"
