"""A greeting app: handlers for the generated greetUser flow."""
