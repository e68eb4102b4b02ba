"""Stage processes: launch, ready handshake, IPC, death watch and shutdown."""
