"""The commands: rabbitflow-broker, rabbitflow-config, rabbitflow-demo, and their options."""
