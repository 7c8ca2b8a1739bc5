"""The asyncio side: listeners, relays, background loops, RabbitMQ clients."""
