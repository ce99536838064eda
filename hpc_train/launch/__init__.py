"""Launch side: config, validation, job layout, local start and Slurm submission.

Nothing in this package imports torch: it runs on busy login nodes where a torch import
costs seconds. Keep it that way (a test checks it).
"""
