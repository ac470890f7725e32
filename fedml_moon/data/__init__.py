"""Data layer: on-disk readers, in-memory datasets, augmentation, party loaders and plots."""
