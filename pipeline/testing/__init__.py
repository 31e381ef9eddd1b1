"""Test doubles that speak real protocols (named as simulators everywhere)."""
