"""``recipes export``: a fine-tuned Hugging Face network written with ``save_pretrained`` (``export_cli``: the
checkpoint resolved, guarded and restored as ``recipes predict`` does it; ``pretrained_export``: the network with its
class names and the image processor or tokenizer that reproduces the training preprocessing; ``command``: the
command line)."""
