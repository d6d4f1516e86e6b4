"""The stortune wire APIs: protobuf contracts and their conversions."""
