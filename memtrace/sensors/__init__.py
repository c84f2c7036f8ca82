"""Sensors: one package per BPF sensor, each giving typed batches to the runtime."""
