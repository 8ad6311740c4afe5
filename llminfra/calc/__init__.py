"""Closed-form models: memory (and, in later chapters, flops, roofline, cost, communication)."""
