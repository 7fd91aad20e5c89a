module gpuremediation.dev/tools/kube-objects

go 1.25.0

require go.yaml.in/yaml/v3 v3.0.4
