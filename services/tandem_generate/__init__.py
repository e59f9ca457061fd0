"""tandem_generate: token-in/token-out generate service feeding pre-rendered features to vLLM."""
