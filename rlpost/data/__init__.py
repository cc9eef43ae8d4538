"""Data pipeline: GSM8K / synthetic problems, chat records, data order, batching, packing."""
