"""The kit's named run configurations (``UNet.yaml``), shipped as package data."""
