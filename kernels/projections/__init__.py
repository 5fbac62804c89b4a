"""Projections onto simplices (shifted or not) and onto a box cut by one equality: the torch and Triton twins and
their dispatchers (`dispatch`)."""

from .dispatch import project_box_equality, project_shifted_simplex, project_simplex

__all__ = ["project_simplex", "project_shifted_simplex", "project_box_equality"]
