"""The results side: reports of finished runs (report.py, its text and plots), t-SNE pictures (tsne.py)
and sweeps (sweep.py)."""
