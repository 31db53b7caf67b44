import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no downloads in tests: weights come from local files
