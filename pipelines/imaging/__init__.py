"""Typed image stages, one module per operation (see base.py for what each declares)."""
