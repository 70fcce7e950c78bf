"""te-conformance's adapter for Hugging Face transformers' SDPA attention
(transformers.integrations.sdpa_attention.sdpa_attention_forward): hf_sdpa.adapter."""
