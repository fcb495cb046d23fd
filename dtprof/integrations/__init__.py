"""Recording under training frameworks, with a line or two: ``hf`` (the Hugging Face
Trainer), ``lightning`` (a Lightning Trainer). Each opens the session that ``dtprof run``
opens by itself (``dtprof.record.auto``), and starts and ends it with the framework's
training."""
