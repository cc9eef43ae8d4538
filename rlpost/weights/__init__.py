"""Weight loading: GGUF (llama.cpp) and Hugging Face safetensors <-> params."""
from rlpost.weights.gguf import default_gguf_path
from rlpost.weights.gguf import load_gguf
from rlpost.weights.safetensors import export_hf_checkpoint
from rlpost.weights.safetensors import load_hf_checkpoint
