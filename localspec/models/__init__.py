"""GGUF models: reading headers (`gguf_header`, `gguf_info`, `gguf_cache`), tokenizer compatibility,
finding files on disk (`discovery`), the catalog, downloads (`hub`, `fetch`) and layer-skip drafts."""
