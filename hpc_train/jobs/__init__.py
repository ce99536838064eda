"""What a submitted job leaves behind, read by the launcher and the reports: its row in jobs.tsv, its state, a sweep's
status, its submission record. No torch: a login node reads it."""
