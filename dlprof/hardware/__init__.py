"""What hardware can do: the device table (datasheet peaks, bandwidths, per-SM limits)."""
