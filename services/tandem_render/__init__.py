"""tandem_render: CPU-only render service (chat/completion requests -> token ids + features)."""
