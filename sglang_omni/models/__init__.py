"""Model packages: each registers its pipeline config classes and adapters."""
