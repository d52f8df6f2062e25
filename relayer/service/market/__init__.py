"""The marketplace catalogue API's services, one module a job (spec: marketplace-api.md)."""
