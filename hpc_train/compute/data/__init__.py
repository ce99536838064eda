"""The data a rank trains on: loaders and samplers over the user's datasets, and batches of any structure."""
