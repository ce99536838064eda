"""The user's code: building their model, datasets and loss from their config nodes, and checking they fit."""
