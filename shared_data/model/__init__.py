"""The model contract both frameworks implement: U-Net layers, canonical weights, FLOPs, the LR schedule."""
