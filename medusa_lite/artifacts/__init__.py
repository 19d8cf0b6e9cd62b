"""Artifacts: the files a drafter is saved as, where they come from, their model card, Hub upload, load()."""
