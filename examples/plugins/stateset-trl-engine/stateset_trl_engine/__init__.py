"""stateset-backend engine plugin for Hugging Face TRL (GRPOTrainer)."""
