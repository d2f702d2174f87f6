"""gym_llm.tools."""
