"""Lineage: content hashes and the provenance record every stage writes."""
