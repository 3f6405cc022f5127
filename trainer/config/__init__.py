"""The recipe: its schema (every key, default and meaning) and how a YAML file becomes one."""
