"""Asyncio building blocks every layer may use (the lowest layer beside ``errors``)."""
