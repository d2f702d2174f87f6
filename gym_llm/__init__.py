"""gym-llm: Gymnasium environments for LLM post-training."""
