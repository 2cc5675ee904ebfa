"""Training the new parameters: the trainer, its command, FSDP, the data and the calibration."""
