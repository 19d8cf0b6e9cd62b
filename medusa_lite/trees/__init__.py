"""Candidate trees: static and dynamic trees, one step's draft, and the step costs that size them."""
