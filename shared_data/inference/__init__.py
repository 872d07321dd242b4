"""Using a trained model: tiled prediction of whole volumes, export for serving, physical validation."""
