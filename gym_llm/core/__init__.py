"""The machinery every env shares: spaces, messages, tasks, templates, episodes, scalar and vector envs."""
