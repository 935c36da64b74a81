"""Learned patch positions for images of another size than the model was trained on (ViT's
`interpolate_pos_encoding`): the table of §4.2's e_n resized to another patch grid. `modeling_turner.py` imports this
module; `save_pretrained` copies it beside it.
"""

import torch
from torch import nn


def resize_patch_positions(table: torch.Tensor, trained_grid: int, grid: tuple[int, int]) -> torch.Tensor:
    """`table` (the class token's row, then one per patch of a `trained_grid` x `trained_grid` image) with the patch
    rows resized (bicubic) to `grid`; the class token's row as it is."""
    patch_table = table[1:].reshape(1, trained_grid, trained_grid, -1).permute(0, 3, 1, 2)
    resized = nn.functional.interpolate(patch_table.float(), size=tuple(grid), mode="bicubic", align_corners=False)
    resized = resized.to(table.dtype).permute(0, 2, 3, 1).reshape(-1, table.shape[-1])
    return torch.cat([table[:1], resized])


__all__ = ["resize_patch_positions"]
