"""Weight loading: GGUF (llama.cpp) and Hugging Face safetensors <-> params."""

from rlpost.models.weights.gguf import default_gguf_path
from rlpost.models.weights.gguf import load_gguf
from rlpost.models.weights.safetensors import export_hf_checkpoint
from rlpost.models.weights.safetensors import load_hf_checkpoint

__all__ = ["default_gguf_path", "load_gguf", "export_hf_checkpoint", "load_hf_checkpoint"]
