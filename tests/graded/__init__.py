"""Graded tests: one file per part of the assignment (assignment.py); python grade.py runs them."""
