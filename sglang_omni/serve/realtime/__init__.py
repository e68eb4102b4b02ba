"""The WebSocket realtime routes: actions and video, and their messages."""
