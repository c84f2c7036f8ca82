"""The agent's lifecycle: the drain, exports, and tracing a command."""
