"""Check a vLLM release's own PCP path (`pcpcheck vllm SOURCE`)."""
