# with_dtype SPECS: the ';'-separated model specs, each with dtype=$DTYPE (sourced by the GPU scripts: every row of a
# GPU comparison in one dtype)
with_dtype() {
    local out="" spec
    IFS=';' read -ra specs <<< "$1"
    for spec in "${specs[@]}"; do out+="$spec,dtype=$DTYPE;"; done
    echo "${out%;}"
}
