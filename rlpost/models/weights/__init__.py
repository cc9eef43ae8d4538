"""Weight loading: GGUF (`gguf.load_gguf`) and Hugging Face safetensors
(`safetensors.load_hf_checkpoint`, `export_hf_checkpoint`) <-> params; a family's weight
map is one module here (`gemma3_names`, `llama_names`), named by its
`rlpost.models.families` entry."""
