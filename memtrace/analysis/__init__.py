"""Analysis: findings drawn from the model."""
