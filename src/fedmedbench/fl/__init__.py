"""Federated learning: methods plug into one registry; ``engine`` is the only Flower user."""
