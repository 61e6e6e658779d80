"""Running the simulation's methods as a real multi-site Flower deployment (docs/deployment.md)."""
