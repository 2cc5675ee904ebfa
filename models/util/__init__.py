"""Small utilities every group reads: atomic writes (atomic.py), the machine key that signs caches (signing.py), file
name limits (path_names.py), where the data folder is (data_dir.py)."""
