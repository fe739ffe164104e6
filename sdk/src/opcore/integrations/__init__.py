"""opcore.integrations: run third-party model code through opcore's ops.

Each subpackage adapts one library and imports it only when the subpackage itself is
imported (an optional extra of the ``opcore`` distribution); ``import opcore`` never
imports them.

- `opcore.integrations.transformers`: Hugging Face transformers Llama, Mistral, Qwen2 and
  Qwen3 models (``pip install 'opcore[transformers]'``).
"""
