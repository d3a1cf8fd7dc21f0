"""vLLM's tokenizer routes: POST /tokenize and /detokenize."""
