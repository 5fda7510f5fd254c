"""Model families and the layers they share."""
