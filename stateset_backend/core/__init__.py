"""Engine-agnostic core: nothing here imports an adapter, the native engine or a heavy library."""
